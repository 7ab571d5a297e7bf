// expect: 4:1: 'A' is not abstract: only abstract nodes have rules (declare it 'node abstract A')
node A (int x) => ();
node B (int x) => ();
A = B;
