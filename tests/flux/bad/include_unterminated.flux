// expect: 2:1: a C header is included as <x.h> or "x.h"
include <stdio.h;
