/* No source: an initial node splays 100 records into an abstract sequence; the flow ends by
 * itself when no event is left. */
node Start () => (int i);
node abstract Pipe (int i) => ();
node Double (int i) => (int i);
node Collect (int i) => ();
initial Start -> Pipe;
Pipe = Double -> Collect;
