// expect: 3:6: the C name 'A_in' (a node) is also generated for node 'A', declared at 2:6
node A () => ();
node A_in () => ();
