// expect: 6:9: unterminated string
// expect: 7:16: unexpected character '#'
// expect: 9:1: unterminated comment
// After a lexer error the statement says nothing more; the next ones are read as usual.
node A () => (int x);
include "types.h;
node B (int x) #=> ();
source A -> B;
/* never closed
node C () => ();
