from hpcmem.cli import main

main()
