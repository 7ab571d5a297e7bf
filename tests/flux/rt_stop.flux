/* Stop and kill with events in flight: Slow events queue on one exclusive key. */
exclusive One () => int *;
node SGen () => (int i);
node Slow (int i, guard One() as one) => ();
source SGen -> Slow;
