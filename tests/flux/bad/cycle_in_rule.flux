// expect: 6:15: cycle: A -> B -> A
node abstract P (int x) => (int x);
node A (int x) => (int x);
node B (int x) => (int x);
node S () => (int x);
P = A -> B -> A;
source S -> P;
