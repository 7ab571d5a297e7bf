// expect: 4:13: type mismatch: 'A' gives 2 fields but 'B' takes 1
node A () => (int x, int y);
node B (int x) => ();
source A -> B;
