"""What more than one test file uses: scripted hosts, inventory builders, runners, stand-ins.

Test files import from here, never from each other (tests/unit/test_test_layout.py checks it).
"""
