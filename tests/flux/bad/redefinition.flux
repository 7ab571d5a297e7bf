// expect: 3:6: redefinition of 'A' (first declared at 2:6)
node A () => ();
node A (int x) => ();
