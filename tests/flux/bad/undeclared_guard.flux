// expect: 2:22: undeclared guard 'H'
node A (int x, guard H(x) as g) => ();
