#include "test.h"

static int hello(void *arg)
{
	(void)arg;
	return 0;
}

TEST(run_returns_main_result)
{
	RUN(hello);
}
