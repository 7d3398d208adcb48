from meridian.cli import main

main()
