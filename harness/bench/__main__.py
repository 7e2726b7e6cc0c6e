from harness.bench import main

main()
