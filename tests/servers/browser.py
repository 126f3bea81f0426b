"""A stand-in for the person at the browser during `cellblock auth login` (set as $BROWSER).

`python browser.py URL` opens the authorization URL the way a browser would: the test
authorization server approves at once and redirects to Cellblock's loopback callback, which this
follows. It prints only the status of the final page.
"""

import sys
import urllib.request

if __name__ == "__main__":
    with urllib.request.urlopen(sys.argv[1], timeout=30) as page:
        print(f"browser: final page {page.status}", file=sys.stderr)
