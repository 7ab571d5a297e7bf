/*
 * textfile.h - opening the broker's text files (configuration, password and ACL files).
 *
 * Only a regular file is read. A FIFO or a device put in a file's place (by mistake or by
 * someone who may write the directory) would block the reader forever, or feed it without
 * end; password and ACL files are reloaded by the broker's signal task, which would then
 * ignore SIGTERM too. The open itself does not block (O_NONBLOCK until the type is known).
 * Nor is a file larger than TEXTFILE_MAX read: a sparse file of gigabytes without a newline
 * would be one line in memory, and hold SIGTERM for as long (an ACL of 10^6 users is 33 MB).
 */
#ifndef MQTT_TEXTFILE_H
#define MQTT_TEXTFILE_H

#define TEXTFILE_MAX_MIB 256

#include <stddef.h>
#include <stdio.h>

/* path opened for reading, or NULL with "PATH: error: WHY" in err. */
FILE *textfile_open(const char *path, char *err, size_t errcap);

#endif
