// Drives a sluice server with the official openai npm client and prints
// what it saw as JSON. Usage: node openai_client.cjs BASE_URL API_KEY
// (NODE_PATH must reach a node_modules holding the openai package).
const OpenAI = require("openai");

async function main() {
  const [baseURL, apiKey] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
  const out = {};
  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);
  const messages = [
    { role: "system", content: "You write Python." },
    { role: "user", content: "def add(a, b):" },
  ];
  const whole = await client.chat.completions.create({ model: out.models[0], messages, max_tokens: 24, temperature: 0 });
  out.chat = whole.choices[0].message.content;
  out.chatFinish = whole.choices[0].finish_reason;
  out.chatUsage = whole.usage;
  const stream = await client.chat.completions.create({
    model: out.models[0], messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  out.stream = "";
  for await (const chunk of stream) {
    if (chunk.choices.length > 0 && chunk.choices[0].delta.content) out.stream += chunk.choices[0].delta.content;
    if (chunk.usage) out.streamUsage = chunk.usage;
  }
  const comp = await client.completions.create({ model: out.models[0], prompt: "def fibonacci(n):", max_tokens: 16, temperature: 0 });
  out.completion = comp.choices[0].text;
  try {
    await client.chat.completions.create({ model: out.models[0], messages, temperature: 5 });
  } catch (e) {
    out.badStatus = e.status;
    out.badCode = e.code;
    out.badType = e.type;
  }
  try {
    const other = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
    await other.models.list();
  } catch (e) {
    out.authStatus = e.status;
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
