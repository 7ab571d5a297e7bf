// expect: 10:1: expected ';' before 'node'
// expect: 10:22: expected ')' before '=>'
// expect: 11:16: unexpected character '@'
// expect: 12:1: unknown declaration 'nonsense'
// expect: 14:14: expected node name before ';'
// expect: 16:9: parameter 'int' has no type
// Each mistake is reported once, and the statements around it are read as usual: A, B, C,
// D and E are declared, so nothing below says they are not.
node A () => (int x)
node B (int x, int y => ();
node C (int x) @=> (int x);
nonsense A -> B;
source A -> C;
	initial D ->;
node D () => ();
node E (int ; x) => ();
initial E;
