/* textfile.c - see textfile.h. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "textfile.h"

#define STR(x) #x
#define XSTR(x) STR(x)
#define TEXTFILE_MAX_MIB_S XSTR(TEXTFILE_MAX_MIB)

FILE *textfile_open(const char *path, char *err, size_t errcap)
{
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	const char *why = NULL;
	if (fd < 0)
		why = strerror(errno);
	else if (fstat(fd, &st) != 0)
		why = strerror(errno);
	else if (!S_ISREG(st.st_mode))
		why = "not a regular file";
	else if (st.st_size > (off_t)TEXTFILE_MAX_MIB << 20)
		why = "larger than " TEXTFILE_MAX_MIB_S " MiB";
	else if (fcntl(fd, F_SETFL, O_RDONLY) != 0)
		why = strerror(errno);
	FILE *f = why ? NULL : fdopen(fd, "r");
	if (!f) {
		if (!why)
			why = strerror(errno);
		snprintf(err, errcap, "%s: error: %s", path, why);
		if (fd >= 0)
			close(fd);
	}
	return f;
}
