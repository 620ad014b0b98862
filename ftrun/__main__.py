from ftrun.cli.app import main

main()
