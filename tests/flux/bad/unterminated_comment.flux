// expect: 2:1: unterminated comment
/* never closed
node A () => ();
