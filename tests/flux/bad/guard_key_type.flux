// expect: 3:33: guard 'G' key 1 has type 'int', but 's' is 'char *'
exclusive G (int k) => int *;
node A (int x, char *s, guard G(s) as g) => ();
