// expect: 3:1: expected ';' before 'node'
node A () => (int x)
node B (int x) => ();
