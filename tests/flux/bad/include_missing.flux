// expect: 2:1: cannot open
include nothere.flux;
