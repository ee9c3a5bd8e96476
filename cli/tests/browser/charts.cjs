// The Charts page in a real browser (Debian's chromium, driven by playwright-core): sign in, open
// Charts from the header, and check that each chart is drawn (a box of some size), that the bars
// carry their counts in <title> (what a hover shows) and that nothing ran or was refused by the
// content security policy. Prints what it read as JSON on its last line.
//
// Environment: DASHBOARD (base URL), TOKEN, REDRIVE_CHROMIUM, REDRIVE_PLAYWRIGHT (node_modules
// holding playwright-core), SCREENSHOTS (a directory).

const path = require('path');
const { chromium } = require(path.join(process.env.REDRIVE_PLAYWRIGHT, 'playwright-core'));

const base = process.env.DASHBOARD;
const shots = process.env.SCREENSHOTS;

function check(condition, message) {
  if (!condition) throw new Error(message);
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.REDRIVE_CHROMIUM,
    args: ['--no-sandbox', '--disable-dev-shm-usage'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const dialogs = [];
    const errors = [];
    page.on('dialog', async (d) => { dialogs.push(d.message()); await d.dismiss(); });
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });

    await page.goto(`${base}/`);
    check(page.url().includes('/login'), `not sent to sign in: ${page.url()}`);
    await page.fill('input[name=token]', process.env.TOKEN);
    await page.click('button[type=submit]');
    await page.waitForSelector('#depth');
    await page.click('header a[href="/charts"]');
    await page.waitForSelector('svg#opened');

    const read = {};
    for (const id of ['opened', 'closed', 'depth', 'oldest']) {
      const box = await page.locator(`svg#${id}`).boundingBox();
      check(box && box.width > 300 && box.height > 100, `chart ${id} is not drawn: ${JSON.stringify(box)}`);
      read[id] = await page.$$eval(`svg#${id} title`, (ts) => ts.map((t) => t.textContent));
    }
    const bar = await page.locator('svg#opened rect.bar').first().boundingBox();
    check(bar && bar.width > 0 && bar.height > 0, `no bar drawn: ${JSON.stringify(bar)}`);
    check(read.opened.some((t) => t.startsWith('ship: 4 opened')), `opened: ${read.opened}`);
    check(read.closed.length > 0, 'no closed bar');
    check(read.depth.some((t) => t.includes('queued')), `depth: ${read.depth}`);
    check((await page.textContent('#sampling')).includes('every 1s'), 'the sampling is not said');

    await page.locator('svg#opened rect.bar').first().hover();
    await page.screenshot({ path: path.join(shots, 'charts-01-page.png'), fullPage: true });
    await page.locator('svg#opened').screenshot({ path: path.join(shots, 'charts-02-opened.png') });
    await page.locator('svg#depth').screenshot({ path: path.join(shots, 'charts-03-depth.png') });
    check(dialogs.length === 0, `a script ran: ${dialogs}`);
    check(errors.length === 0, `the console reported: ${errors}`);
    console.log(JSON.stringify(read));
  } finally {
    await browser.close();
  }
})().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
