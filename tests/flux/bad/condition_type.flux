// expect: 5:6: condition 'isEven' takes 'int' but field 1 of 'P' (s) is 'char *'
condition isEven (int a) => bool;
node abstract P (char *s) => ();
node B (char *s) => ();
P : [isEven] = B;
