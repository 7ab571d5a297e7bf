// expect: 4:21: the last input of handler 'H' must be 'int err'
node A () => (int x);
node N (int x) => ();
node H (int x, long e) => ();
handle error N -> H;
