/* placeholder: model I/O (in progress) */
#include "ganglion/model.h"
