// expect: 2:10: unexpected character '@'
node A ()@ => ();
