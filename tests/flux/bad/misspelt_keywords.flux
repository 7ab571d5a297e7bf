// expect: 10:1: unknown declaration 'nod'; did you mean 'node'?
// expect: 11:6: unknown node modifier 'detahced'; did you mean 'detached'?
// expect: 13:27: expected 'read' or 'write' after '/', not 'raed'; did you mean 'read'?
// expect: 13:41: unknown word 'gaurd'; did you mean 'guard'?
// expect: 14:1: unknown declaration 'soruce'; did you mean 'source'?
// expect: 15:8: expected 'error' before 'eror'; did you mean 'error'?
// A misspelt word is read as the word it resembles: the statement is otherwise checked as
// usual, and the names it declares are known below.
readwrite R (int k) => int *;
nod Dwarf (int x) => ();
node detahced Oops (int x, int err) => ();
node Apple () => (int x);
node Work (int x, guard R/raed(x) as r, gaurd R/write(x) as w) => ();
soruce Apple -> Dwarf;
handle eror Dwarf -> Oops;
