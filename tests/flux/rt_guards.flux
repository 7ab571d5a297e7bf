/* Every guard kind under concurrency, and the global order with a precedence. */
exclusive Cell (int key) => int *;
readwrite Table (int key) => int *;
pool Conn () => int *;
free Cfg () => int *;
precedence Table < Cell;
node GGen () => (int k);
node abstract Fan (int k) => ();
node Ex (int k, guard Cell(k) as cell) => ();
node Rd (int k, guard Table/read(k) as t) => ();
node Wr (int k, guard Table/write(k) as t) => ();
node Pl (int k, guard Conn() as c, guard Cfg() as cfg) => ();
node CellFirst (int k, guard Cell(k) as c, guard Table/write(k) as t) => ();
node TableFirst (int k, guard Table/write(k) as t, guard Cell(k) as c) => ();
node Rd2 (int k, guard Table/read(k) as t) => ();
condition readOnly (int k) => bool;
source GGen -> Fan;
Fan : [readOnly] = Rd & Rd2;
Fan : [*] = Ex & Rd & Wr & Pl & CellFirst & TableFirst;
