/* A detached node splays records from a pool thread; its task routes them once it returns. */
node DStart () => (int n);
node detached DSplay (int n) => (int i);
node DCollect (int i) => ();
initial DStart -> DSplay -> DCollect;
