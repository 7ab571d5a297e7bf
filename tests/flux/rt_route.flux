/* Routing: conditions pick a rule, '*' catches the rest, a fan-out feeds two nodes, a failing
 * node's input goes to its handler. */
condition isEven (int n) => bool;
condition isSmall (int n) => bool;
node RGen () => (int n, int tag);
node abstract Classify (int n, int tag) => ();
node Even (int n, int tag) => ();
node SmallOdd (int n, int tag) => ();
node abstract Rest (int n, int tag) => ();
node Odd1 (int n, int tag) => ();
node Odd2 (int n, int tag) => ();
node EvenErr (int n, int tag, int err) => ();
source RGen -> Classify;
Classify : [isEven] = Even;
Classify : [isSmall, *] = SmallOdd;
Classify : [*] = Rest;
Rest = Odd1 & Odd2;
handle error Even -> EvenErr;
