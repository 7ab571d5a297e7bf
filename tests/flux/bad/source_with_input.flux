// expect: 3:8: source 'A' must have no input fields
node A (int x) => ();
source A;
