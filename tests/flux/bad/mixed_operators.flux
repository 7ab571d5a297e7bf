// expect: 4:11: cannot mix '->' and '&' in one rule: name the parts with abstract nodes
node abstract P (int x) => ();
node A (int x) => (int x);
P = A & A -> A;
