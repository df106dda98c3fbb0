#include "loom/base.h"
int main(void) {
    return 0;
}
