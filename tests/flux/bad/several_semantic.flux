// expect: 13:6: redefinition of 'Sink' (first declared at 10:6)
// expect: 9:25: readwrite guard 'R' is taken as R/read or R/write
// expect: 9:42: undeclared guard 'H'
// expect: 14:15: type mismatch: field 1 of 'Src' is 'long' (x) but 'Work' wants 'int' (x)
// expect: 15:8: undeclared node 'Dwarff'; did you mean 'Dwarf'?
// expect: 18:6: undeclared condition 'isOdd'
// check.c goes on after each error: every one is reported, each once.
readwrite R (int k) => int *;
node Work (int x, guard R(x) as r, guard H(x) as h) => (int x);
node Sink (int x) => ();
node Dwarf () => (int x);
node Src () => (long x);
node Sink (char *s) => ();
source Src -> Work -> Sink;
source Dwarff -> Sink;
node abstract P (int x) => ();
node Q (int x) => ();
P : [isOdd] = Q;
