/* weft-flux.c - main(), alone, so that tests/flux.c can link the rest of the compiler and call
 * flux_main itself: see driver.c for the command line. */
#include "flux.h"

int main(int argc, char **argv)
{
	return flux_main(argc, argv);
}
