// expect: 4:6: undeclared condition 'isOdd'
node abstract P (int a) => ();
node B (int a) => ();
P : [isOdd] = B;
