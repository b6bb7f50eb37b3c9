/*
 * Arrow-ready columns -> file-log record batches (the write side of derived feeds).
 */
#include "speedups.h"

PyMethodDef hw_batch_columns_methods[] = {
    {NULL, NULL, 0, NULL},
};
