"""`python -m kiln.conformance [PATTERN ...]`: run matching backend tests and print failures and totals."""

from kiln.conformance.suite import main

raise SystemExit(main())
