// The S3 client moved to sluice/core/s3_client.h (connectors use it too: the files sink on S3). This header only
// forwards there, so that branches written against the old path still build; include the new path.
#pragma once

#include "sluice/core/s3_client.h"
