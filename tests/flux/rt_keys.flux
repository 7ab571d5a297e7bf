/* One guard taken twice by a node, with keys in either order or equal: the run-time orders
 * the two by key, so (1,2) and (2,1) cannot deadlock, and an equal key is taken once. */
exclusive Pair (int k) => int *;
node KGen () => (int a, int b);
node Two (int a, int b, guard Pair(a) as x, guard Pair(b) as y) => ();
source KGen -> Two;
