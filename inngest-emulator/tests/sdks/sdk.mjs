// Inngest's official JS SDK against the emulator, in production mode (signatures checked both
// ways). `node sdk.mjs serve` serves three functions and prints their URL; `node sdk.mjs send
// '<events JSON>'` sends events with the SDK's client and prints the ids it got back.
import { createServer } from "node:http";
import { Inngest, NonRetriableError } from "inngest";
import { serve } from "inngest/node";

const [mode, arg] = process.argv.slice(2);
const inngest = new Inngest({
  id: "js-app",
  baseUrl: process.env.EMULATOR_URL,
  isDev: false,
  signingKey: process.env.EMULATOR_SIGNING_KEY,
  eventKey: process.env.EMULATOR_EVENT_KEY,
});

if (mode === "send") {
  const { ids } = await inngest.send(JSON.parse(arg));
  console.log(JSON.stringify(ids));
  process.exit(0);
}

const functions = [
  inngest.createFunction({ id: "greet", retries: 2, triggers: [{ event: "app/greet" }] }, async ({ event, step }) => {
    const shout = await step.run("shout", () => event.data.name.toUpperCase());
    await step.sleep("pause", "1s");
    return { hello: shout };
  }),
  inngest.createFunction(
    {
      id: "flaky",
      retries: 2,
      triggers: [{ event: "app/flaky" }],
      onFailure: async ({ event, error }) => ({ failed: event.data.function_id, message: error.message }),
    },
    async ({ attempt }) => {
      throw new Error(`boom on attempt ${attempt}`);
    },
  ),
  inngest.createFunction({ id: "refuse", triggers: [{ event: "app/refuse" }] }, async () => {
    throw new NonRetriableError("refused for good");
  }),
];
const server = createServer(serve({ client: inngest, functions }));
server.listen(0, "127.0.0.1", () => console.log(`http://127.0.0.1:${server.address().port}/api/inngest`));
