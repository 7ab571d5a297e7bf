// expect: 2:11: guard 'G' must hold a pointer type, not 'int'
exclusive G (int k) => int;
