// expect: 4:9: undeclared node 'Missing'
node abstract P (int x) => ();
node A (int x) => ();
P = A & Missing;
node S () => (int x);
source S -> P;
