// expect: 6:23: cycle: S -> A -> B -> A
// A chain that comes back to a node is a cycle, reported as one (not as A placed twice).
node S () => (int x);
node A (int x) => (int x);
node B (int x) => (int x);
source S -> A -> B -> A;
