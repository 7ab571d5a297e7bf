// expect: 8:28: expected ')' before '=>'
// expect: 11:13: type mismatch: field 1 of 'S' is 'int' (x) but 'T' wants 'char *' (s)
// A declaration that did not parse whole is still known by its name, and its types are not
// held against anyone; a mistake elsewhere is reported all the same.
node S () => (int x);
node T (char *s) => ();
node U () => (int x);
node Broken (int x, int y  => (int x);
source U -> Broken;
handle error Broken -> T;
source S -> T;
