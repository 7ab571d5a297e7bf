// expect: 9:6: cycle: R -> S1 -> R
// expect: 9:11: cycle: X -> X
// No one statement shows these: an event for R goes to S1, which sends it to R; and X's
// output goes where S1's goes, which is where R's goes: back to X.
node abstract R (int x) => (int x);
node abstract S1 (int x) => (int x);
node X (int x) => (int x);
R = S1;
S1 = R -> X;
