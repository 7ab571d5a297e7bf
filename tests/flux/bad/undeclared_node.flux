// expect: 3:13: undeclared node 'Nope'
node A () => (int x);
source A -> Nope;
