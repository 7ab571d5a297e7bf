// expect: 4:13: type mismatch: field 1 of 'A' is 'int' (x) but 'B' wants 'char *' (s)
node A () => (int x);
node B (char *s) => ();
source A -> B;
