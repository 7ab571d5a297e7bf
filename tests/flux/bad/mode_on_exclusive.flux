// expect: 3:22: only readwrite guards take /read or /write; 'E' is not one
exclusive E (int k) => int *;
node A (int x, guard E/read(x) as g) => ();
