/*
 * File-log record batches -> Arrow-ready columns (the read side of derived feeds).
 */
#include "speedups.h"

PyMethodDef hw_log_columns_methods[] = {
    {NULL, NULL, 0, NULL},
};
