// expect: 7:13: node 'B' is placed twice in the flow with different successors (first at 5:13)
node A () => (int x);
node B (int x) => (int x);
node C (int x) => ();
source A -> B -> C;
node D () => (int x);
source D -> B;
