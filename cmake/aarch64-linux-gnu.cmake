# Cross-build for aarch64 Linux with the Debian/Ubuntu GNU toolchain; tests run under qemu-user.
#   apt-get install g++-aarch64-linux-gnu qemu-user-static
# Linked statically so qemu-aarch64-static needs no aarch64 sysroot at run time.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")

find_program(VITFAST_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(NOT VITFAST_QEMU_AARCH64)
  message(FATAL_ERROR "qemu-aarch64-static not found: apt-get install qemu-user-static")
endif()
set(CMAKE_CROSSCOMPILING_EMULATOR ${VITFAST_QEMU_AARCH64})

set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
