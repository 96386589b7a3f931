/* placeholder: generation engine (in progress) */
#include "ganglion/model.h"
