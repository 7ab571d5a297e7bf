/* group.h - what task.c asks of task groups (group.c): cancelling a task with everything it
 * owns, and a task's exit from the groups it belongs to and owns. */
#ifndef WEFT_GROUP_H
#define WEFT_GROUP_H

#include "task.h"

/* weft_cancel of a pinned (or otherwise live) record: t, then every member of every group t
 * owns, down the tree. */
void group_cancel_task(weft_task *t);

/* t is ending: the groups it owns have no owner from now on. */
void group_disown(weft_task *t);

/* Member t is ending with its function's result: it leaves its group, whose error the result
 * becomes if it is the first failure (which cancels the group). */
void group_leave(weft_task *t, int result);
#endif
