// expect: 5:17: precedence cycle: 'G1' would come before itself (G1 < G2 < G1)
exclusive G1 (int k) => int *;
exclusive G2 (int k) => int *;
precedence G1 < G2;
precedence G2 < G1;
