// expect: 5:5: abstract node 'P' expands into itself (P -> Q -> P)
node abstract P (int x) => ();
node abstract Q (int x) => ();
P = Q;
Q = P;
