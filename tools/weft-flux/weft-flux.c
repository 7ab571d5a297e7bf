/* weft-flux.c - the program: see main.c for the command line. */
#include "flux.h"

int main(int argc, char **argv)
{
	return flux_main(argc, argv);
}
